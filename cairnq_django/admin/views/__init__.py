"""The task admin's own pages: stats, dashboard, the task page's buttons, and the workers list.

The stats, dashboard and task page views are functions of (model_admin,
request, ...) that TaskAdmin.get_urls binds to the admin with functools.partial.
"""
