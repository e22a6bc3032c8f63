"""Control: the mechanism in force of each collection (:mod:`.collection_state`, one owner), the
``ldp.config`` and ``ldp.dlq`` topics kept alive (:mod:`.control_topic`), and the adaptive
controller (:mod:`.controller`): what enters is the counts of adaptive collections, what leaves
is signed mechanism states published to ``ldp.config`` (docs/adaptive.md)."""
