"""What every pipeline's definitions share: resources, the publishing IO managers, pools and priorities, the
index assets' common parts."""
