"""The `tensorforge` command."""
