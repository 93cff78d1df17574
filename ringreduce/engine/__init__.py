"""The engine: one background thread per process that, cycle by cycle, exchanges the ranks'
states (wire), agrees on what is ready everywhere (negotiation, cache, agreement), groups it
(fusion) and has it executed in the agreed order (loop). It makes no MPI call of its own but
through the wire and the algorithms."""
