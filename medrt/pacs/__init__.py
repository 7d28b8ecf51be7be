"""The PACS face: a C-STORE listener with a durable spool, and the results sent back by C-STORE.

- :mod:`medrt.pacs.spool`: the inbox (fsync'd files + a SQLite index, series-complete by
  idle time, recovery after a crash);
- :mod:`medrt.pacs.scp`: the Storage SCP (pynetdicom) that answers Success only once an
  image is on disk;
- :mod:`medrt.pacs.service`: complete series through the batch core (the same analyzer
  for every series), SEG/SR (and SC) forwarded;
- :mod:`medrt.pacs.scu`: the Storage SCU that forwards them;
- :mod:`medrt.pacs.commitment`: storage commitment reports to the senders;
- :mod:`medrt.pacs.loop`: the background thread the worker and the reporter share.
"""
