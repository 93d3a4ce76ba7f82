"""Repository functions: take a session, read or write rows, never commit."""
