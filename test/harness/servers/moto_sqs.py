"""moto's server (argv as `python3 -m moto.server`) with SQS FIFO deduplication as AWS documents it.

moto 5.2.1 drops a FIFO message only while a message with the same deduplication id is still in
the queue; Amazon SQS drops it for 5 minutes after the first was *sent*, consumed and deleted or
not ("any messages sent with the same message deduplication ID are accepted successfully but
aren't delivered during the 5-minute deduplication interval"). The cloud mode relies on the
latter (a forwarder replica announcing a change the functions already consumed), so this wrapper
keeps a per-queue history of deduplication ids for that interval, keyed by message group when
the queue's DeduplicationScope is messageGroup. Everything else is moto's.
"""
import sys

from moto.server import main
from moto.sqs.models import DEDUPLICATION_TIME_IN_SECONDS, Queue

_moto_add_message = Queue.add_message


def _add_message(self, message):
    dedup = message.deduplication_id
    if self.fifo_queue and dedup:
        history = self.__dict__.setdefault("_kapp_lambda_dedup_history", {})
        now = message.sent_timestamp
        window_ms = DEDUPLICATION_TIME_IN_SECONDS * 1000
        for key in [k for k, sent in history.items() if now - sent >= window_ms]:
            del history[key]
        scope = self.attributes.get("DeduplicationScope") == "messageGroup"
        key = (message.group_id if scope else "", dedup)
        if key in history:
            return  # accepted, not delivered
        history[key] = now
    _moto_add_message(self, message)


Queue.add_message = _add_message

if __name__ == "__main__":
    main(sys.argv[1:])
