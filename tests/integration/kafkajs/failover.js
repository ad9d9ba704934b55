// kafkajs idempotent producer across a leader SIGKILL: prints every acked value as JSON lines.
// ONE_PARTITION_PER_SEND=1: one send() per partition (no retry can skip a partition).
const { Kafka, logLevel } = require(process.env.KAFKAJS || 'kafkajs')
const [bootstrap, topic, total] = [process.argv[2], process.argv[3], parseInt(process.argv[4])]
const kafka = new Kafka({ brokers: bootstrap.split(','), logLevel: logLevel.NOTHING, retry: { retries: 20, initialRetryTime: 100 } })
const producer = kafka.producer({ idempotent: true, maxInFlightRequests: 1 })
;(async () => {
  await producer.connect()
  for (let i = 0; i < total; i += 10) {
    const messages = []
    for (let j = i; j < i + 10; j++) messages.push({ partition: j % 2, value: `v${String(j).padStart(6, '0')}` })
    try {
      if (process.env.ONE_PARTITION_PER_SEND) {
        for (const p of [0, 1]) await producer.send({ topic, acks: -1, messages: messages.filter(m => m.partition === p) })
      } else {
        await producer.send({ topic, acks: -1, messages })
      }
      for (const m of messages) console.log(JSON.stringify({ acked: m.value, partition: m.partition }))
    } catch (e) {
      console.log(JSON.stringify({ failed: i, error: e.message }))
    }
    if (i % 200 === 0) console.error(`progress ${i}`)
  }
  await producer.disconnect()
})()
