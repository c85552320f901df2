"""The job worker (``sluice jobs``): a Celery worker that runs async jobs.

Each job's requests go to its model's streams through the same submission path as a
gateway's (``sluice.api.handlers``), answers come back on this process's reply key, and
results are written to the job's keys in Redis (``sluice.broker.job_store``). The user's
guide: docs/user-guide/jobs.md.
"""
