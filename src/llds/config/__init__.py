"""The one config system: YAML files with `base:` inheritance, dotted overrides, typed checks."""
