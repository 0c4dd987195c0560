"""The console's screens besides the main one: help, interval editor, confirmation, rank detail."""
