"""Small subcommands that need no package of their own."""
