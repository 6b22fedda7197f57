// Kills an agent while it waits for the quota and resumes it from its checkpoint, without a
// re-plan. Starts the mock provider on 127.0.0.1, runs resume-agent.mjs; when it reports
// its checkpoint (written before a long queued wait), kills it (SIGKILL: no clean-up runs),
// edits one of the files it had read, and starts it again. Checks that the second run did
// not plan again, read only the changed file, and sent the call its wait had held (handed
// to its onLongWait hook, saved in the checkpoint): the provider saw exactly two calls
// (the plan, then step 2). Exits non-zero if anything differs.
//
//   node resume.mjs            (Node >= 22; the test script runs it on Node 24)
import { spawn } from 'node:child_process'
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { createInterface } from 'node:readline'
import { fileURLToPath } from 'node:url'
import { startMockProvider } from 'tokenwarden-testing/mock-provider'

const agentScript = fileURLToPath(new URL('./resume-agent.mjs', import.meta.url))
const work = mkdtempSync(join(tmpdir(), 'tokenwarden-resume-'))
const workspace = join(work, 'repo')
const checkpoints = join(work, 'checkpoints')
mkdirSync(workspace)
writeFileSync(join(workspace, 'parse.js'), 'export const parse = (s) => s.split(" ")\n')
writeFileSync(join(workspace, 'lexer.js'), 'export const lex = (s) => [...s]\n')
writeFileSync(join(workspace, 'README.md'), '# parser\n')

const mock = await startMockProvider({ inputTokensPerMinute: 6000, outputTokensPerMinute: 100_000, concurrency: 8, replyTokens: 40 })
const failures = []
const check = (ok, what) => {
  console.log(`${ok ? 'ok  ' : 'FAIL'} ${what}`)
  if (!ok) failures.push(what)
}

/** Runs the agent; `onEvent` sees each JSON line and may kill it. Resolves with the events and how it ended. */
function run(onEvent) {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [agentScript, mock.url, workspace, checkpoints], { stdio: ['ignore', 'pipe', 'inherit'] })
    const events = []
    createInterface({ input: child.stdout }).on('line', (line) => {
      let e
      try {
        e = JSON.parse(line)
      } catch {
        console.log(`  agent: ${line}`)
        return
      }
      events.push(e)
      console.log(`  agent ${child.pid}: ${line}`)
      onEvent(e, child)
    })
    child.on('error', reject)
    child.on('exit', (code, signal) => resolve({ events, code, signal }))
  })
}

const timer = setTimeout(() => {
  console.error('FAIL the example did not finish within 120 s')
  process.exit(1)
}, 120_000)

try {
  console.log('first run: plan, read three files, then a long wait for the quota')
  const first = await run((e, child) => {
    if (e.event === 'checkpoint') child.kill('SIGKILL')
  })
  check(first.signal === 'SIGKILL', 'the agent was killed during its wait (after writing its checkpoint)')
  const cp = first.events.find((e) => e.event === 'checkpoint')
  check(cp !== undefined && cp.reason === 'queued' && cp.waitMs > 1000, `the core called the wait long before it began (${cp?.reason}, ${cp?.waitMs} ms)`)
  check(mock.stats().completed === 1, `the provider saw only the plan before the kill (${mock.stats().completed} calls)`)
  // The agent kept no copy of its step-2 call: the checkpoint holds the one the wait held.
  const saved = JSON.parse(readFileSync(join(checkpoints, 'worker-1.json'), 'utf8'))
  const held = saved.nextCall
  check(held?.model === 'claude-sonnet-4-6' && held?.max_tokens === 200 && String(held?.messages?.[0]?.content).startsWith('STEP 2: apply the plan.'), 'the checkpoint holds the call the wait held, as the SDK built it')

  writeFileSync(join(workspace, 'lexer.js'), 'export const lex = (s) => s.split(/\\t| /)\n')
  console.log('lexer.js edited while the agent was down; second run:')
  const second = await run(() => {})
  const resumed = second.events.find((e) => e.event === 'resumed')
  const done = second.events.find((e) => e.event === 'done')
  check(second.code === 0, `the resumed agent finished (exit ${second.code})`)
  check(resumed !== undefined && resumed.step === 2, 'it resumed at step 2 from its checkpoint')
  check(!second.events.some((e) => e.event === 'planned'), 'it did not plan again')
  check(JSON.stringify(resumed?.changed) === '["lexer.js"]' && JSON.stringify(resumed?.unchanged) === '["parse.js","README.md"]', `resume named the changed file (${JSON.stringify(resumed?.changed)})`)
  check(JSON.stringify(done?.reads) === '["lexer.js"]', `it re-read only the changed file (${JSON.stringify(done?.reads)})`)
  check(mock.stats().completed === 2, `the provider saw two calls in all: the plan and the prepared step-2 call (${mock.stats().completed})`)
  check(mock.stats().rejected429 === 0, 'no 429')
} finally {
  clearTimeout(timer)
  await mock.close()
  rmSync(work, { recursive: true, force: true })
}
if (failures.length > 0) {
  console.error(`resume example: ${failures.length} check(s) failed`)
  process.exit(1)
}
console.log('resume example: the killed agent resumed from its checkpoint without a re-plan')
