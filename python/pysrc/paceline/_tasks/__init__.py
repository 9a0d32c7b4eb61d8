"""The task-queue decision every queue's shell shares (Celery, RQ, Dramatiq, arq): a
task's rates, kept where its ``storage_uri`` says, booked for each execution; the
booked instant a task handed back to its queue carries, so that its turn is neither lost
nor spent twice; and the budget turn around the body."""
