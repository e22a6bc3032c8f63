"""The functional core: pure numpy/scipy estimation code. No I/O, no clocks, no global RNG."""
from .domain import Domain, Factor
from .mechanism import (MECHANISMS, Estimate, Mechanism, TensorSpec, from_state, mechanism_class,
                        register)

__all__ = ["Domain", "Factor", "Estimate", "Mechanism", "TensorSpec", "MECHANISMS", "from_state",
           "mechanism_class", "register"]
