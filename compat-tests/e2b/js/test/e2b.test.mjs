// E2B's JS SDKs (e2b, @e2b/code-interpreter), unchanged, against a real
// sandgate gateway: the quickstart flows of compat-tests/e2b's Python suite.
// The gateway is $SANDGATE_BIN serve with the workdir driver; the SDKs find
// it through E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY (docs/compat.md).
import { after, before, test } from 'node:test'
import assert from 'node:assert/strict'
import { spawn, spawnSync } from 'node:child_process'
import { mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { randomBytes } from 'node:crypto'
import { setTimeout as sleep } from 'node:timers/promises'

import { Sandbox, CommandExitError } from 'e2b'
import { Sandbox as CodeInterpreter } from '@e2b/code-interpreter'

const inCI = process.env.CI === 'true'
let gw
let dir

before(async () => {
  const bin = process.env.SANDGATE_BIN
  if (!bin) {
    if (inCI) throw new Error('SANDGATE_BIN is not set (make test-e2b sets it)')
    return
  }
  dir = mkdtempSync(join(tmpdir(), 'sandgate-e2b-js-'))
  const key = randomBytes(16).toString('hex')
  gw = spawn(bin, ['serve', '--listen', '127.0.0.1:0', '--data-dir', join(dir, 'data'), '--ready-file', join(dir, 'ready'),
    '--api-key', key, '--sandbox', 'workdir', '--rate-limit', '100000'], { stdio: 'ignore' })
  let url = ''
  for (let i = 0; i < 400 && !url; i++) {
    try { url = readFileSync(join(dir, 'ready'), 'utf8').trim() } catch { await sleep(50) }
  }
  assert.ok(url, 'the gateway did not get ready')
  process.env.E2B_API_URL = `${url}/compat/e2b`
  process.env.E2B_SANDBOX_URL = `${url}/compat/e2b/sandbox`
  process.env.E2B_API_KEY = key
  delete process.env.E2B_DOMAIN
  delete process.env.E2B_DEBUG
})

after(async () => {
  if (gw) {
    const exited = new Promise((resolve) => gw.once('exit', resolve))
    gw.kill('SIGTERM')
    await exited
  }
  if (dir) rmSync(dir, { recursive: true, force: true })
})

function gateway(t) {
  if (!gw) { t.skip('SANDGATE_BIN is not set'); return false }
  return true
}

async function waitFor(cond, what, ms = 20000) {
  const end = Date.now() + ms
  while (!cond()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`)
    await sleep(50)
  }
}

test('create, run, background command with onStdout, kill', async (t) => {
  if (!gateway(t)) return
  const sbx = await Sandbox.create()
  try {
    assert.equal((await sbx.commands.run('echo hi')).stdout, 'hi\n')
    let seen = ''
    const handle = await sbx.commands.run('for i in 1 2 3; do echo line$i; sleep 0.1; done; sleep 600',
      { background: true, onStdout: (d) => { seen += d } })
    await waitFor(() => seen.includes('line3'), "the background command's third line")
    assert.equal(await sbx.commands.kill(handle.pid), true)
    await assert.rejects(handle.wait(), CommandExitError)
    assert.equal(await sbx.commands.kill(handle.pid), false)
  } finally {
    await sbx.kill()
  }
})

test('files and watchDir', async (t) => {
  if (!gateway(t)) return
  const sbx = await Sandbox.create()
  try {
    const d = `e2b-js-${randomBytes(4).toString('hex')}`
    assert.equal(await sbx.files.makeDir(d), true)
    const events = []
    const watcher = await sbx.files.watchDir(d, (e) => { events.push(e) })
    try {
      await sbx.files.write(`${d}/a.txt`, 'alpha')
      await waitFor(() => events.some((e) => e.name === 'a.txt'), 'a watch event for a.txt')
    } finally {
      await watcher.stop()
    }
    assert.equal(await sbx.files.read(`${d}/a.txt`), 'alpha')
    assert.deepEqual((await sbx.files.list(d)).map((e) => e.name), ['a.txt'])
    await sbx.files.rename(`${d}/a.txt`, `${d}/b.txt`)
    assert.deepEqual((await sbx.files.list(d)).map((e) => e.name), ['b.txt'])
    await sbx.files.remove(`${d}/b.txt`)
    assert.deepEqual(await sbx.files.list(d), [])
  } finally {
    await sbx.kill()
  }
})

test('setTimeout, list, pause and connect keeping files, kill', async (t) => {
  if (!gateway(t)) return
  const tag = randomBytes(8).toString('hex')
  const sbx = await Sandbox.create({ metadata: { tag } })
  try {
    await sbx.setTimeout(600_000)
    const listed = await Sandbox.list({ query: { metadata: { tag } } }).nextItems()
    assert.deepEqual(listed.map((s) => s.sandboxId), [sbx.sandboxId])
    await sbx.files.write('kept.txt', 'kept')
    assert.equal(await sbx.pause(), true)
    assert.equal((await Sandbox.getInfo(sbx.sandboxId)).state, 'paused')
    const again = await Sandbox.connect(sbx.sandboxId)
    assert.equal((await Sandbox.getInfo(sbx.sandboxId)).state, 'running')
    assert.equal(await again.files.read('kept.txt'), 'kept')
  } finally {
    assert.equal(await sbx.kill(), true)
  }
  assert.deepEqual(await Sandbox.list({ query: { metadata: { tag } } }).nextItems(), [])
})

test('code interpreter: state, error traceback, plot', async (t) => {
  if (!gateway(t)) return
  const sbx = await CodeInterpreter.create()
  try {
    assert.equal((await sbx.runCode('x = 1')).error, undefined)
    assert.equal((await sbx.runCode('x + 1')).text, '2')
    const failed = await sbx.runCode("raise ValueError('bad')")
    assert.equal(failed.error.name, 'ValueError')
    assert.match(failed.error.traceback, /Traceback/)
    // The workdir sandboxes run the python3 of a sandbox's default PATH
    // (sandbox/process.go), not this process's (a pyenv shim, say).
    const sandboxPath = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
    if (spawnSync('/bin/sh', ['-c', "python3 -c 'import matplotlib'"], { env: { PATH: sandboxPath } }).status !== 0) {
      if (inCI) assert.fail("the host's python3 has no matplotlib in CI")
      t.diagnostic("the plot is skipped: the host's python3 has no matplotlib (apt-get install python3-matplotlib)")
      return
    }
    const plot = await sbx.runCode('import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()')
    const pngs = plot.results.filter((r) => r.png).map((r) => Buffer.from(r.png, 'base64').subarray(0, 4).toString('latin1'))
    assert.deepEqual(pngs, ['\x89PNG'])
  } finally {
    await sbx.kill()
  }
})
