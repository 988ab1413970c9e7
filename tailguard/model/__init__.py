"""The served model, read from its files: no engine, no torch in the API's path.

Owns what the model's files say (``info``), which model a deployment serves
(``served``) and how a Hugging Face id becomes local files (``hub``), the default model
(``bundled``, converted from GGUF by ``convert``), the demo models (``demo``), prompt
token counting for the native API (``tokens``).
May import: ``errors``, ``settings``.
"""
