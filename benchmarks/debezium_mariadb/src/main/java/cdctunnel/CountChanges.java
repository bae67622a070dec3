package cdctunnel;

import io.debezium.embedded.Connect;
import io.debezium.engine.DebeziumEngine;
import io.debezium.engine.RecordChangeEvent;
import io.debezium.engine.format.ChangeEventFormat;
import org.apache.kafka.connect.source.SourceRecord;

import java.io.FileInputStream;
import java.io.IOException;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.atomic.AtomicLong;

/**
 * Debezium's change-event rate with nothing of ours in the way (benchmarks/mysql_source.py): runs the embedded
 * engine with the connector properties of the file given first, in Kafka Connect's own record format (no JSON
 * serialisation), counts the data change events inside this JVM and exits once it has counted the number given
 * second. Prints one JSON line: {@code {"events": n, "seconds": s}}, s from the first change event to the last,
 * so the JVM's and the engine's start are not in it.
 */
public final class CountChanges {
    public static void main(String[] args) throws IOException, InterruptedException {
        Properties props = new Properties();
        try (FileInputStream in = new FileInputStream(args[0])) {
            props.load(in);
        }
        long expected = Long.parseLong(args[1]);
        AtomicLong first = new AtomicLong();
        AtomicLong last = new AtomicLong();
        AtomicLong count = new AtomicLong();
        CountDownLatch done = new CountDownLatch(1);
        DebeziumEngine<RecordChangeEvent<SourceRecord>> engine = DebeziumEngine.create(ChangeEventFormat.of(Connect.class))
                .using(props)
                .notifying((records, committer) -> {
                    for (RecordChangeEvent<SourceRecord> event : records) {
                        SourceRecord record = event.record();
                        // data change events only: schema-change events go to the topic prefix itself
                        if (record.value() != null && record.topic() != null && record.topic().contains(".")) {
                            first.compareAndSet(0, System.nanoTime());
                            if (count.incrementAndGet() == expected) {
                                last.set(System.nanoTime());
                                done.countDown();
                            }
                        }
                        committer.markProcessed(event);
                    }
                    committer.markBatchFinished();
                })
                .using((success, message, error) -> {
                    if (!success) {
                        System.err.println("engine stopped: " + message);
                        if (error != null) {
                            error.printStackTrace();
                        }
                        System.exit(2);
                    }
                })
                .build();
        ExecutorService executor = Executors.newSingleThreadExecutor();
        executor.execute(engine);
        done.await();
        System.out.printf("{\"events\": %d, \"seconds\": %.6f}%n", count.get(), (last.get() - first.get()) / 1e9);
        System.out.flush();
        engine.close();
        System.exit(0);
    }
}
