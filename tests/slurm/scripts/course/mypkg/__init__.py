"""The course's model package, a sibling of scripts/ (imported through sys.path, not installed)."""
