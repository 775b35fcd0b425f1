"""Training presets shipped with the package: `llds train --config NAME` loads `NAME.yaml`."""
