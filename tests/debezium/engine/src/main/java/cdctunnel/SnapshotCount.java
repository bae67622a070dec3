package cdctunnel;

import io.debezium.engine.DebeziumEngine;
import io.debezium.engine.RecordChangeEvent;
import io.debezium.engine.format.ChangeEventFormat;
import io.debezium.embedded.Connect;
import org.apache.kafka.connect.source.SourceRecord;

import java.io.FileInputStream;
import java.io.IOException;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

/**
 * Debezium's snapshot rate with nothing of ours in the way (benchmarks/postgres_source.py): runs the embedded
 * engine with the connector properties of the file given first, in Kafka Connect's own record format (no JSON
 * serialisation), counts the data records inside this JVM and exits once it has counted the number given
 * second. Prints one line to stdout: {@code task_started_ms first_record_ms last_record_ms records}, in
 * milliseconds since the engine was built, so the snapshot phase is measured from the connector task's start
 * (Debezium's own event) to the last row, whatever the JVM's and the engine's start cost.
 */
public final class SnapshotCount {
    public static void main(String[] args) throws IOException, InterruptedException {
        Properties props = new Properties();
        try (FileInputStream in = new FileInputStream(args[0])) {
            props.load(in);
        }
        long expected = Long.parseLong(args[1]);
        AtomicLong started = new AtomicLong();
        AtomicLong first = new AtomicLong();
        AtomicLong last = new AtomicLong();
        AtomicLong count = new AtomicLong();
        CountDownLatch done = new CountDownLatch(1);
        long origin = System.nanoTime();
        DebeziumEngine<RecordChangeEvent<SourceRecord>> engine = DebeziumEngine.create(ChangeEventFormat.of(Connect.class))
                .using(props)
                .using(new DebeziumEngine.ConnectorCallback() {
                    @Override
                    public void taskStarted() {
                        started.compareAndSet(0, System.nanoTime());
                    }
                })
                .notifying((records, committer) -> {
                    for (RecordChangeEvent<SourceRecord> event : records) {
                        if (event.record().value() != null) {
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
        System.out.printf("%d %d %d %d%n", TimeUnit.NANOSECONDS.toMillis(started.get() - origin),
                TimeUnit.NANOSECONDS.toMillis(first.get() - origin), TimeUnit.NANOSECONDS.toMillis(last.get() - origin),
                count.get());
        System.out.flush();
        engine.close();
        System.exit(0);
    }
}
