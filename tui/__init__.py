"""The terminal UI: chat with a model while the timings panel shows where each step's time goes.

`python -m toolkit chat` (or `python -m tui`) starts it; tui/app.py is the app, tui/session.py the
conversation, tui/settings.py the settings modal, tui/help.py the keys (F1), tui/timings_panel.py the
live timings and tui/step_stats.py their numbers (the like-with-like A/B comparison).
"""
