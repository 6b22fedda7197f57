// One agent's turn, resumable: plan (one model call), read the files the plan needs, then
// make the step-2 call. If that call has to wait long (the core says `checkpoint`), the
// turn is written down first, with the call the wait holds as the wrapped fetch hands it
// over (the agent keeps no copy of its own); started again after a kill, the agent picks
// the turn up from its checkpoint: no new plan, only the files that changed are read
// again, and the held call is sent. Driven by resume.mjs; prints one JSON line per event.
//
//   node resume-agent.mjs <provider url> <workspace> <checkpoint dir>
import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import Anthropic from '@anthropic-ai/sdk'
import { Checkpoints, createTokenwarden } from 'tokenwarden'

const [providerUrl, workspace, checkpointDir] = process.argv.slice(2)
if (checkpointDir === undefined) {
  console.error('usage: node resume-agent.mjs <provider url> <workspace> <checkpoint dir>')
  process.exit(2)
}
const AGENT = 'worker-1'
const MODEL = 'claude-sonnet-4-6'
const FILES = ['parse.js', 'lexer.js', 'README.md']
const say = (event) => console.log(JSON.stringify(event))

// A small quota: 6,000 input tokens a minute (resume.mjs gives the mock provider the same
// limit: the core trusts what the provider's headers report). The plan takes most of it,
// so the step-2 call waits for the refill (tens of seconds): longer than
// `checkpoint_after_ms`, which is 1 s here (30 s by default).
const tw = createTokenwarden({
  config: { pools: [{ name: MODEL, input_tokens_per_minute: 6000, output_tokens_per_minute: 100_000 }], call: { checkpoint_after_ms: 1000 } },
})
const checkpoints = new Checkpoints(checkpointDir, { root: workspace })
const reads = []
const read = (file) => {
  reads.push(file)
  return readFileSync(join(workspace, file), 'utf8')
}

// What the agent knows of its turn; the call it is about to make is not kept here: the
// core hands it to `onLongWait` (`wait.call.body`, exactly as it will be sent).
let turn = null
const client = new Anthropic({
  apiKey: 'sk-test-key',
  baseURL: providerUrl,
  maxRetries: 0,
  fetch: tw.fetch({
    agent: AGENT,
    // The core decided this wait is long: write the turn and the held call down first.
    onLongWait: async (wait) => {
      if (turn === null) return
      await checkpoints.save(AGENT, { ...turn, nextCall: wait.call.body })
      say({ event: 'checkpoint', reason: wait.reason, waitMs: wait.waitMs, step: turn.step, heldModel: wait.call.model })
    },
  }),
})

const saved = await checkpoints.resume(AGENT)
let answer
if (saved === null) {
  const plan = await client.messages.create({
    model: MODEL,
    max_tokens: 200,
    messages: [{ role: 'user', content: `PLAN how to make the parser handle tabs. ${'context '.repeat(1700)}` }],
  })
  say({ event: 'planned', outputTokens: plan.usage.output_tokens })
  const known = Object.fromEntries(FILES.map((f) => [f, read(f)]))
  turn = { goal: 'make the parser handle tabs', step: 2, decisions: ['split on tabs in parse.js', 'leave the lexer alone'], files: FILES }
  answer = await client.messages.create({
    model: MODEL,
    max_tokens: 200,
    messages: [{ role: 'user', content: `STEP 2: apply the plan.\n${Object.entries(known).map(([f, t]) => `--- ${f}\n${t}`).join('\n')}\n${'detail '.repeat(1400)}` }],
  })
} else {
  say({ event: 'resumed', step: saved.step, changed: saved.changed, unchanged: saved.unchanged, missing: saved.missing, waitedMs: saved.waitedMs, cacheExpired: saved.cacheExpired })
  // The held call as the checkpoint has it; only what changed is read again, and goes
  // with it as an addendum.
  const fresh = saved.changed.map((f) => `--- ${f} (changed while this agent waited)\n${read(f)}`)
  const call = saved.nextCall
  if (fresh.length > 0) call.messages[0].content += `\n${fresh.join('\n')}`
  turn = { goal: saved.goal, step: saved.step, decisions: saved.decisions, files: FILES }
  answer = await client.messages.create(call)
}

await checkpoints.clear(AGENT)
say({ event: 'done', step: turn.step, reads, outputTokens: answer.usage.output_tokens })
tw.close()
