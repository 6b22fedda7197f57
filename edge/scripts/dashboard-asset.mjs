// Writes the dashboard page (src/dashboard.js) as the asset native `tokenwarden serve`
// serves (serve/assets/dashboard.html, with the fleet, quota and endpoint paths as
// placeholders it fills in, escaped as dashboardHtml escapes them) and its Content Security
// Policy (serve/assets/dashboard.csp). The page is written once, in dashboard.js; the
// edge suite checks that the asset is what this script makes (test/format.test.mjs).
//
//   node edge/scripts/dashboard-asset.mjs          writes them
//   node edge/scripts/dashboard-asset.mjs --check  exits 1 if they differ
import { readFileSync, writeFileSync } from 'node:fs'
import { fileURLToPath } from 'node:url'
import { dashboardAsset } from '../src/dashboard.js'

const out = (name) => fileURLToPath(new URL(`../../serve/assets/${name}`, import.meta.url))
const { html, csp } = dashboardAsset()
if (process.argv.includes('--check')) {
  const same = readFileSync(out('dashboard.html'), 'utf8') === html && readFileSync(out('dashboard.csp'), 'utf8') === csp
  if (!same) {
    console.error('serve/assets/dashboard.{html,csp} differ from edge/src/dashboard.js: run node edge/scripts/dashboard-asset.mjs')
    process.exit(1)
  }
} else {
  writeFileSync(out('dashboard.html'), html)
  writeFileSync(out('dashboard.csp'), csp)
}
