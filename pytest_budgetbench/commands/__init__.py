"""The ``budgetbench`` console command and its subcommands."""
