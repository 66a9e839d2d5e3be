"""Small tools with no protocol in them: atomic files, child processes, progress lines."""
