"""The admin side: the admin API, the console, and their authentication throttle."""
