"""What a batch becomes: events checked and framed, scalar records built from columns, their points."""
