"""Framework (`django.tasks`) tasks for the CairnQ backend's tests.

Installed only in tests/settings_tasks.py, the settings of the worker
processes those tests start; the test process imports the modules directly.
"""
