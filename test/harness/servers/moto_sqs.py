"""moto's server (argv as `python3 -m moto.server`) with SQS FIFO deduplication as AWS documents it.

moto 5.2.1 drops a FIFO message only while a message with the same deduplication id is still in
the queue; Amazon SQS drops it for 5 minutes after the first was *sent*, consumed and deleted or
not ("any messages sent with the same message deduplication ID are accepted successfully but
aren't delivered during the 5-minute deduplication interval"). The cloud mode relies on the
latter (a forwarder replica announcing a change the functions already consumed), so this wrapper
keeps a per-queue history of deduplication ids for that interval, keyed by message group when
the queue's DeduplicationScope is messageGroup.

moto 5.2.1 also gives every message the same `SenderId` (its constant `AIDAIT2UOQQY3AUEKVGXU`),
whoever sent it; SQS sets it from the credentials, `<role id>:<session name>` for an assumed
role's. So a message sent with the credentials of a role session that moto's STS issued
(`AssumeRole`) gets that role's id and the session name, as on AWS (the dispatched mode's run
sessions, docs/decisions.md D15); any other sender keeps moto's constant.
Everything else is moto's.
"""
import sys
import threading

from moto.iam.models import iam_backends
from moto.server import main
from moto.sqs.models import DEDUPLICATION_TIME_IN_SECONDS, Message, Queue
from moto.sqs.responses import SQSResponse
from moto.sts.models import sts_backends

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

_sending = threading.local()


def _assumed_sender_id(access_key):
    """`<role id>:<session name>` of the STS session of `access_key`; None for any other key."""
    for account in list(sts_backends.keys()):
        for backend in list(sts_backends[account].values()):
            session = backend.get_assumed_role_from_access_key(access_key)
            if session is None:
                continue
            role_account = session.role_arn.split(":")[4]
            for iam in list(iam_backends[role_account].values()):
                for role in iam.get_roles():
                    if role.arn == session.role_arn:
                        return f"{role.id}:{session.session_name}"
            return None
    return None


def _as_sender(action):
    def wrapped(self):
        _sending.sender_id = _assumed_sender_id(self.get_access_key())
        try:
            return action(self)
        finally:
            _sending.sender_id = None

    return wrapped


_moto_message_init = Message.__init__


def _message_init(self, *args, **kwargs):
    _moto_message_init(self, *args, **kwargs)
    sender = getattr(_sending, "sender_id", None)
    if sender:
        self.sender_id = sender


Message.__init__ = _message_init
SQSResponse.send_message = _as_sender(SQSResponse.send_message)
SQSResponse.send_message_batch = _as_sender(SQSResponse.send_message_batch)

if __name__ == "__main__":
    main(sys.argv[1:])
