"""Executions and files in a claimed runner, on Nomad's allocation exec of its runner task.

- commands.py: the command lines run in the task (the launcher with its time limit, the
  kill, the file scripts) and the parsing of their output; pure.
- activity.py: a request is activity on the runner's claim (its deadline moves); runners
  with running executions keep their claims and have their executions stopped when the
  claim ends.
- manager.py: executions, waited or streamed, their time limits and cancellation.
- files.py, archives.py: uploads (a JSON body or a tar archive), listings, downloads.

The HTTP side (routes, the stream's frames) is controller/api/execution_routes.py.
"""
