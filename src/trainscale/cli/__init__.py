"""Command line: one module per subcommand, parsing and printing only. Nothing imports `cli`."""
