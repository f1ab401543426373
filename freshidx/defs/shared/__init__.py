"""What every pipeline's definitions share: resources, the publishing IO managers, the index assets' common parts."""
