"""Reports: rich tables and matplotlib charts."""
