package cdctunnel;

import io.debezium.engine.ChangeEvent;
import io.debezium.engine.DebeziumEngine;
import io.debezium.engine.format.Json;

import java.io.FileInputStream;
import java.io.IOException;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.Base64;
import java.util.Properties;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;

/**
 * Runs Debezium's embedded engine with the connector properties of the file given as the only argument and
 * writes every change event to stdout as one line: {@code <base64 key>\t<base64 value>}, an empty value
 * for a tombstone. Base64 keeps each event on one line whatever its JSON holds. The engine commits an event
 * after the line is flushed, so a line on stdout is an event Debezium handed over. Runs until killed.
 */
public final class DebeziumToLines {
    public static void main(String[] args) throws IOException {
        Properties props = new Properties();
        try (FileInputStream in = new FileInputStream(args[0])) {
            props.load(in);
        }
        PrintStream out = new PrintStream(System.out, false, StandardCharsets.UTF_8);
        Base64.Encoder b64 = Base64.getEncoder();
        DebeziumEngine<ChangeEvent<String, String>> engine = DebeziumEngine.create(Json.class)
                .using(props)
                .notifying((records, committer) -> {
                    for (ChangeEvent<String, String> event : records) {
                        String key = event.key() == null ? "" : event.key();
                        String value = event.value() == null ? "" : event.value();
                        out.print(b64.encodeToString(key.getBytes(StandardCharsets.UTF_8)));
                        out.print('\t');
                        out.print(b64.encodeToString(value.getBytes(StandardCharsets.UTF_8)));
                        out.print('\n');
                        committer.markProcessed(event);
                    }
                    out.flush();
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
    }
}
