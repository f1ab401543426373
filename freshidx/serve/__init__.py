"""Reading what is published: the searcher and ``freshidx status``."""
