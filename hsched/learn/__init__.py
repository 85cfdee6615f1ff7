"""What hsched learns and accounts: kinds, predictions, profiles, efficiency, fair share, accounting."""
