"""The terminal UI: chat with a model while the timings panel shows where each step's time goes.

`python -m toolkit chat` (or `python -m tui`) starts it; tui/app.py is the app, tui/session.py the
conversation, tui/settings.py the settings modal, tui/timings_panel.py the live timings.
"""
