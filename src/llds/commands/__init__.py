"""`llds` subcommands: one module per subcommand (see `llds.cli`)."""
