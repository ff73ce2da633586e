"""Template tags for the admin's own pages."""
