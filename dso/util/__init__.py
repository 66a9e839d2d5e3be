"""Small tools with no protocol in them: atomic files, child processes (and a pre-imported interpreter that
forks them), progress lines."""
