"""The three-worker rebalance test of tests/test_cluster_pipeline.py (12 partitions, workers join
and leave mid-stream, counts exact) run again on Apache Kafka; the other tests of that module
(Redis Cluster failovers) do not depend on the broker and run on Tansu only."""
from __future__ import annotations

import pytest
import test_cluster_pipeline

pytestmark = [pytest.mark.pipeline, pytest.mark.kafka]


@pytest.fixture
def kafka_broker(apache_kafka):
    return apache_kafka


test_three_workers_join_and_leave_on_apache_kafka = (
    test_cluster_pipeline.test_three_workers_twelve_partitions_join_and_leave)
