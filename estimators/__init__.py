"""The functional core: pure numpy/scipy estimation code. No I/O, no clocks, no global RNG."""
from ldpstream.estimators.kernels.domain import Domain, Factor
from ldpstream.estimators.mechanism import (
                        MECHANISMS,
                        Estimate,
                        Mechanism,
                        ParamError,
                        TensorSpec,
                        VersionedCounts,
                        from_state,
                        mechanism_class,
                        mechanism_names,
                        register,
)

__all__ = ["Domain", "Factor", "Estimate", "Mechanism", "TensorSpec", "MECHANISMS", "from_state",
           "mechanism_class", "mechanism_names", "register", "ParamError", "VersionedCounts"]
