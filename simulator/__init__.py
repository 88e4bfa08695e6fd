"""tilesim package."""
