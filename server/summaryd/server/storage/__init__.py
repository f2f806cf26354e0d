"""Where the bytes go on local disk: run paths, event files, journals, the session store, the state directory."""
