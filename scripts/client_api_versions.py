"""Which request versions the installed librdkafka sends to a broker that offers Kafka 4.2's
maxima: whether the stock client here speaks transaction version 2 (KIP-890 part 2 needs
EndTxn v5 and Produce v12; a client that sends older versions gets transaction version 1).

Starts a one-broker local cluster whose brokers (through a ``sitecustomize`` on their
``PYTHONPATH``) advertise the higher maxima in ApiVersions, runs one transaction with
offsets (InitProducerId, AddPartitionsToTxn, Produce, AddOffsetsToTxn, TxnOffsetCommit,
EndTxn) with librdkafka's protocol debug on, and prints each request's version as
librdkafka logged it. Usage: ``.venv/bin/python scripts/client_api_versions.py``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

KAFKA_4_2_MAXIMA = {"PRODUCE": 13, "END_TXN": 5, "ADD_PARTITIONS_TO_TXN": 5,
                    "ADD_OFFSETS_TO_TXN": 4, "TXN_OFFSET_COMMIT": 5, "INIT_PRODUCER_ID": 6,
                    "FIND_COORDINATOR": 6}
"""The requests of a transaction, at Kafka 4.2's ApiVersions maxima."""

_SITECUSTOMIZE = f"""
from minibroker.network import codec
for name, hi in {KAFKA_4_2_MAXIMA!r}.items():
    key = codec.ApiKey[name]
    codec.SUPPORTED_API_VERSIONS[key] = (codec.SUPPORTED_API_VERSIONS[key][0], hi)
"""

_TRANSACTION = """
import sys
from pathlib import Path
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from undertow.platform.local import LocalPlatform, LocalPlatformConfig
one = {"transaction.state.log.replication.factor": "1", "transaction.state.log.min.isr": "1",
       "offsets.topic.replication.factor": "1"}
with LocalPlatform(LocalPlatformConfig(workdir=Path(sys.argv[1]), brokers=1,
                                       broker_config=one)) as cluster:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic("probe", 1, 1)])["probe"].result(30)
    group = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "probe"})
    p = Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": "probe",
                  "debug": "protocol"})
    p.init_transactions(30)
    p.begin_transaction()
    p.produce("probe", b"x", partition=0)
    p.send_offsets_to_transaction([TopicPartition("probe", 0, 1)],
                                  group.consumer_group_metadata(), 30)
    p.commit_transaction(30)
"""


def main() -> int:
    import confluent_kafka

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "sitecustomize.py").write_text(_SITECUSTOMIZE)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            filter(None, [tmp, os.environ.get("PYTHONPATH")]))}
        done = subprocess.run([sys.executable, "-c", _TRANSACTION, tmp], env=env,
                              capture_output=True, text=True, timeout=300)
    if done.returncode:
        print(done.stdout[-2000:], done.stderr[-4000:], file=sys.stderr)
        return 1
    sent = sorted(set(re.findall(r"Sent (\w+)Request \(v(\d+)", done.stderr)))
    print(f"librdkafka {confluent_kafka.libversion()[0]} (confluent-kafka "
          f"{confluent_kafka.__version__}), broker offering Kafka 4.2's maxima:")
    for api, version in sent:
        print(f"  {api:<20} v{version}")
    speaks = dict(sent)
    tv2 = int(speaks.get("EndTxn", -1)) >= 5 and int(speaks.get("Produce", -1)) >= 12
    print("transaction version 2 (EndTxn v5+, Produce v12+):", "yes" if tv2 else "no")
    return 0


if __name__ == "__main__":
    sys.exit(main())
