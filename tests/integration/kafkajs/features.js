// kafkajs 2.2 against pidlease, one scenario per run; prints JSON lines on stdout.
//   node features.js BOOTSTRAP admin TOPIC
//   node features.js BOOTSTRAP compress TOPIC CODEC N   (CODEC: gzip | snappy | lz4 | zstd)
//   node features.js BOOTSTRAP consume TOPIC GROUP      (until SIGTERM; then leaves the group)
//   node features.js BOOTSTRAP offsets TOPIC GROUP
//   node features.js BOOTSTRAP transaction TOPIC
const { Kafka, logLevel, CompressionTypes } = require('kafkajs')
const [bootstrap, scenario, topic] = process.argv.slice(2, 5)
const kafka = new Kafka({
  clientId: 'kafkajs-features',
  brokers: bootstrap.split(','),
  logLevel: logLevel.NOTHING,
  retry: { retries: parseInt(process.env.KAFKAJS_RETRIES || '10'), initialRetryTime: 200 }
})
const out = o => console.log(JSON.stringify(o))
const fail = e => { out({ error: e.message, type: e.type || e.name }); process.exit(3) }

async function admin () {
  const a = kafka.admin()
  await a.connect()
  const created = await a.createTopics({
    waitForLeaders: true,
    topics: [{ topic, numPartitions: 2, replicationFactor: 1, configEntries: [{ name: 'retention.ms', value: '3600000' }] }]
  })
  out({ created })
  let meta = await a.fetchTopicMetadata({ topics: [topic] })
  out({ partitions: meta.topics[0].partitions.length })
  const cfg = await a.describeConfigs({ includeSynonyms: false, resources: [{ type: 2, name: topic, configNames: ['retention.ms'] }] })
  out({ retention: cfg.resources[0].configEntries.map(e => e.configValue) })
  await a.createPartitions({ topicPartitions: [{ topic, count: 4 }] })
  meta = await a.fetchTopicMetadata({ topics: [topic] })
  out({ partitions_after: meta.topics[0].partitions.length })
  try {
    await a.createTopics({ topics: [{ topic: `${topic}-bad`, configEntries: [{ name: 'max.message.bytes', value: '1' }] }] })
    out({ bad_config: 'accepted' })
  } catch (e) {
    out({ bad_config: (e.errors && e.errors[0] && e.errors[0].type) || e.type || e.message })
  }
  await a.deleteTopics({ topics: [topic] })
  out({ deleted: (await a.listTopics()).includes(topic) === false })
  await a.disconnect()
}

async function compress (codec, n) {
  const p = kafka.producer({ idempotent: true, maxInFlightRequests: 1 })
  await p.connect()
  const type = { gzip: CompressionTypes.GZIP, snappy: CompressionTypes.Snappy, lz4: CompressionTypes.LZ4, zstd: CompressionTypes.ZSTD }[codec]
  try {
    for (let i = 0; i < n; i += 100) {
      const messages = []
      for (let j = i; j < Math.min(n, i + 100); j++) messages.push({ partition: 0, value: `{"client": "kafkajs", "n": ${String(j).padStart(6, '0')}, "pad": "${'ab'.repeat(40)}"}` })
      await p.send({ topic, acks: -1, compression: type, messages })
    }
    out({ sent: n })
  } catch (e) {
    out({ error: e.message })
  }
  await p.disconnect()
}

async function consume (group) {
  const c = kafka.consumer({ groupId: group, sessionTimeout: 10000, heartbeatInterval: 500, rebalanceTimeout: 10000 })
  c.on(c.events.GROUP_JOIN, e => out({ joined: e.payload.memberAssignment[topic] || [] }))
  await c.connect()
  await c.subscribe({ topics: [topic], fromBeginning: true })
  await c.run({
    eachMessage: async ({ partition, message }) => out({ partition, offset: Number(message.offset), value: message.value.toString() })
  })
  out({ running: true })
  let stopping = false
  process.on('SIGTERM', async () => {
    if (stopping) return
    stopping = true
    await c.disconnect() // commits what was consumed and leaves the group
    out({ left: true })
    process.exit(0)
  })
}

async function transaction () {
  const p = kafka.producer({ transactionalId: 'kafkajs-tx', idempotent: true, maxInFlightRequests: 1 })
  const t0 = Date.now()
  try {
    await p.connect()
    const tx = await p.transaction()
    await tx.send({ topic, messages: [{ partition: 0, value: 'in a transaction' }] })
    await tx.commit()
    out({ committed: true })
  } catch (e) {
    out({ error: e.message, type: e.type || e.name, after_ms: Date.now() - t0 })
  }
  await p.disconnect()
}

async function offsets (group) {
  const a = kafka.admin()
  await a.connect()
  const got = await a.fetchOffsets({ groupId: group, topics: [topic] })
  out({ offsets: got[0].partitions.map(p => [p.partition, Number(p.offset)]) })
  const listed = await a.listGroups()
  out({ groups: listed.groups.map(g => g.groupId) })
  const described = await a.describeGroups([group])
  out({ state: described.groups[0].state })
  await a.disconnect()
}

;(async () => {
  if (scenario === 'admin') await admin()
  else if (scenario === 'compress') await compress(process.argv[5], parseInt(process.argv[6]))
  else if (scenario === 'consume') await consume(process.argv[5])
  else if (scenario === 'offsets') await offsets(process.argv[5])
  else if (scenario === 'transaction') await transaction()
  else throw new Error(`unknown scenario ${scenario}`)
})().catch(fail)
