"""The served model, read from its files: no engine, no torch in the API's path.

Owns what the model's files say (``info``), which model a deployment serves
(``served``), the demo models (``demo``), prompt token counting (``tokens``) and chat
templates (``chat``).
May import: ``errors``, ``settings``.
"""
