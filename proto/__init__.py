"""Protocol buffers of the rdtune node agent (``rdtune/v1/*.proto``) and their build step."""
