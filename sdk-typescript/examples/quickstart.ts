import { writeFile } from "node:fs/promises";
import { SandboxClient } from "@sandgate/sdk";

// baseUrl and apiKey default to $SANDBOX_API_URL and $SANDBOX_API_TOKEN.
const client = new SandboxClient();
const session = await client.createSession({ ttlSeconds: 600, metadata: { project: "demo" } });
try {
  const ssh = await session.ssh(); // host keys pinned from the REST answer
  try {
    const res = await ssh.runCommand("echo hello from $(uname -s)");
    console.log(res.stdout.trim(), "exit", res.exitCode);
    await writeFile("local_script.sh", "echo 'made in the sandbox' > output.txt\n");
    await ssh.uploadFile("local_script.sh", "remote_script.sh");
    await ssh.runCommand("sh remote_script.sh");
    await ssh.downloadFile("output.txt", "output.txt");
  } finally {
    await ssh.close();
  }
} finally {
  await session.destroy();
}
