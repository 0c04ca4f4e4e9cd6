"""The apps on the loop: bench, server, chat, tune, reports."""
