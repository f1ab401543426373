"""Publication, knowing no pipeline: manifest, requirements, compare-and-swap of the pointer; rollback and
garbage collection.
"""
