"""The README example as a script: create a session, run commands, move files, delete it.

    SANDBOX_API_URL=https://gw.example.com SANDBOX_API_TOKEN=... python3 quickstart.py

Needs a local_script.py in the current directory that writes output.txt.
"""

import os

from sandbox_sessions_sdk import SessionsClient, SessionSSHClient

API_URL = os.environ["SANDBOX_API_URL"]
TOKEN = os.environ["SANDBOX_API_TOKEN"]

with SessionsClient(api_url=API_URL, bearer_token=TOKEN) as sessions:
    session = sessions.create_session(ttl=3600, metadata={"project": "demo"})
with SessionSSHClient(api_url=API_URL, bearer_token=TOKEN, session_id=session.session_id, username="sandbox") as ssh:
    res = ssh.run_command("python3 --version")
    print(res["stdout"])
    ssh.upload_file("local_script.py", "remote_script.py")
    print(ssh.run_command("python3 remote_script.py")["stdout"])
    ssh.download_file("output.txt", "output.txt")
with SessionsClient(api_url=API_URL, bearer_token=TOKEN) as sessions:
    sessions.delete_session(session.session_id)
