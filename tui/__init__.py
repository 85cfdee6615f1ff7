"""The Textual dashboard (`hsched dash`), installed as hsched.tui."""
