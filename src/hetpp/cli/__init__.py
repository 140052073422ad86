"""Command-line interface: one module per `hetpp` subcommand."""
