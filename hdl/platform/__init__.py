"""Board platforms: the pin tables the constraints are generated from, and the Vivado flow."""
