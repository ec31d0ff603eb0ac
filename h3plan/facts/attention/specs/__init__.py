"""One declaration per attention backend (torch-free): what it takes, needs from the hardware facts and returns."""
