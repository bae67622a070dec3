package cdctunnel.sdk;

import com.alicloud.openservices.tablestore.ClientConfiguration;
import com.alicloud.openservices.tablestore.SyncClient;
import com.alicloud.openservices.tablestore.TunnelClient;
import com.alicloud.openservices.tablestore.model.Column;
import com.alicloud.openservices.tablestore.model.ColumnValue;
import com.alicloud.openservices.tablestore.model.PrimaryKeyBuilder;
import com.alicloud.openservices.tablestore.model.PrimaryKeyColumn;
import com.alicloud.openservices.tablestore.model.PrimaryKeyValue;
import com.alicloud.openservices.tablestore.model.RecordColumn;
import com.alicloud.openservices.tablestore.model.RecordSequenceInfo;
import com.alicloud.openservices.tablestore.model.RowUpdateChange;
import com.alicloud.openservices.tablestore.model.StreamRecord;
import com.alicloud.openservices.tablestore.model.UpdateRowRequest;
import com.alicloud.openservices.tablestore.model.tunnel.ChannelInfo;
import com.alicloud.openservices.tablestore.model.tunnel.CreateTunnelRequest;
import com.alicloud.openservices.tablestore.model.tunnel.DescribeTunnelRequest;
import com.alicloud.openservices.tablestore.model.tunnel.DescribeTunnelResponse;
import com.alicloud.openservices.tablestore.model.tunnel.ListTunnelRequest;
import com.alicloud.openservices.tablestore.model.tunnel.TunnelInfo;
import com.alicloud.openservices.tablestore.model.tunnel.TunnelType;
import com.alicloud.openservices.tablestore.tunnel.worker.IChannelProcessor;
import com.alicloud.openservices.tablestore.tunnel.worker.ProcessRecordsInput;
import com.alicloud.openservices.tablestore.tunnel.worker.TunnelWorker;
import com.alicloud.openservices.tablestore.tunnel.worker.TunnelWorkerConfig;
import com.google.gson.Gson;
import com.google.gson.GsonBuilder;
import java.io.BufferedReader;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Base64;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * Consumes one tunnel of a Tablestore instance the way the service's users do: the SDK's own TunnelClient and
 * TunnelWorker, with the worker's default checkpointing (DefaultChannelProcessor checkpoints after a
 * process() call once the interval has passed, and "finished" at a channel's end).
 *
 * <p>Each delivered record is appended to the records file as one JSON line (channel, record type, primary
 * key, columns with their column types, sequence info) and flushed before process() returns, so that a
 * checkpoint never covers a record that is not in the file: a worker killed at any point loses nothing, and
 * the restarted one redelivers at most what came after the last checkpoint.
 *
 * <p>Environment: OTS_ENDPOINT, OTS_INSTANCE, OTS_ACCESS_KEY_ID, OTS_ACCESS_KEY_SECRET, OTS_TABLE,
 * OTS_TUNNEL_NAME (the BaseAndStream tunnel, created through the SDK unless it exists), RECORDS_FILE;
 * optional HEARTBEAT_INTERVAL_SEC (default 5, the SDK's minimum), HEARTBEAT_TIMEOUT_SEC (default 15),
 * CHECKPOINT_INTERVAL_MS (default 200), RESPONSE_VALIDATION ("true": the SDK checks every response's
 * headers and signature, which TunnelClient turns off by default).
 *
 * <p>Prints "working TUNNEL_ID" once the worker is connected. Standard input drives it: a line "describe"
 * prints the SDK's DescribeTunnel as one JSON line; "delete-version ID COLUMN TS" deletes one version of a
 * cell of the row with integer key column "id" through the SDK's SyncClient (the Python SDK cannot encode
 * that UpdateRow) and prints "ok"; "stop" or the end of input shuts down as a user's program would (worker,
 * then client) and exits 0.
 */
public final class TunnelWorkerMain {
    private TunnelWorkerMain() {
    }

    private static String env(String name) {
        String value = System.getenv(name);
        if (value == null || value.isEmpty()) {
            throw new IllegalArgumentException("environment variable " + name + " is required");
        }
        return value;
    }

    private static long envLong(String name, long fallback) {
        String value = System.getenv(name);
        return value == null || value.isEmpty() ? fallback : Long.parseLong(value);
    }

    /**
     * Appends records as JSON lines; one lock, since the worker processes channels on a thread pool. A batch
     * goes out in one write(2) of an unbuffered stream, so a SIGKILL never leaves half a line for the
     * restarted worker to append to.
     */
    static final class RecordsFile implements IChannelProcessor {
        private final FileOutputStream out;
        private final Gson gson = new GsonBuilder().serializeNulls().disableHtmlEscaping().create();

        RecordsFile(FileOutputStream out) {
            this.out = out;
        }

        @Override
        public void process(ProcessRecordsInput input) {
            StringBuilder lines = new StringBuilder();
            for (StreamRecord record : input.getRecords()) {
                lines.append(gson.toJson(toJson(input.getChannelId(), record))).append('\n');
            }
            synchronized (out) {
                try {
                    out.write(lines.toString().getBytes(StandardCharsets.UTF_8));
                } catch (IOException e) {
                    // Losing a record silently would make the comparison lie: stop the JVM instead.
                    System.err.println("cannot write the records file: " + e);
                    Runtime.getRuntime().halt(3);
                }
            }
        }

        @Override
        public void shutdown() {
        }
    }

    static Map<String, Object> toJson(String channelId, StreamRecord record) {
        Map<String, Object> line = new LinkedHashMap<>();
        line.put("channel", channelId);
        line.put("type", record.getRecordType().name());
        Map<String, Object> pk = new LinkedHashMap<>();
        for (PrimaryKeyColumn column : record.getPrimaryKey().getPrimaryKeyColumns()) {
            pk.put(column.getName(), primaryKeyValue(column.getValue()));
        }
        line.put("pk", pk);
        List<Map<String, Object>> columns = new ArrayList<>();
        for (RecordColumn rc : record.getColumns()) {
            Column column = rc.getColumn();
            Map<String, Object> c = new LinkedHashMap<>();
            c.put("name", column.getName());
            c.put("type", rc.getColumnType().name());
            // Deletes carry no value; the SDK then holds an empty placeholder we must not read.
            c.put("value", rc.getColumnType() == RecordColumn.ColumnType.PUT ? value(column.getValue()) : null);
            c.put("ts", column.hasSetTimestamp() ? column.getTimestamp() : null);
            columns.add(c);
        }
        line.put("columns", columns);
        RecordSequenceInfo seq = record.getSequenceInfo();
        if (seq != null) {
            Map<String, Object> s = new LinkedHashMap<>();
            s.put("epoch", seq.getEpoch());
            s.put("timestamp", seq.getTimestamp());
            s.put("rowIndex", seq.getRowIndex());
            line.put("seq", s);
        } else {
            line.put("seq", null);
        }
        return line;
    }

    private static Object primaryKeyValue(PrimaryKeyValue value) {
        switch (value.getType()) {
            case INTEGER:
                return value.asLong();
            case STRING:
                return value.asString();
            case BINARY:
                return Map.of("blob", Base64.getEncoder().encodeToString(value.asBinary()));
            default:
                throw new IllegalStateException("unexpected primary-key type " + value.getType());
        }
    }

    private static Object value(ColumnValue value) {
        switch (value.getType()) {
            case INTEGER:
                return value.asLong();
            case STRING:
                return value.asString();
            case BOOLEAN:
                return value.asBoolean();
            case DOUBLE:
                return Map.of("double", value.asDouble());
            case BINARY:
                return Map.of("blob", Base64.getEncoder().encodeToString(value.asBinary()));
            default:
                throw new IllegalStateException("unexpected column type " + value.getType());
        }
    }

    static Map<String, Object> describe(DescribeTunnelResponse resp) {
        Map<String, Object> d = new LinkedHashMap<>();
        d.put("tunnelId", resp.getTunnelInfo().getTunnelId());
        d.put("tunnelType", resp.getTunnelInfo().getTunnelType().name());
        d.put("stage", resp.getTunnelInfo().getStage().name());
        d.put("expired", resp.getTunnelInfo().isExpired());
        List<Map<String, Object>> channels = new ArrayList<>();
        for (ChannelInfo info : resp.getChannelInfos()) {
            Map<String, Object> c = new LinkedHashMap<>();
            c.put("id", info.getChannelId());
            c.put("type", info.getChannelType().name());
            c.put("status", info.getChannelStatus().name());
            c.put("clientId", info.getClientId());
            channels.add(c);
        }
        d.put("channels", channels);
        return d;
    }

    /** The tunnel's id: found by ListTunnel (a restarted worker), else created, as a user's program does. */
    private static String tunnelId(TunnelClient client, String table, String name) {
        for (TunnelInfo info : client.listTunnel(new ListTunnelRequest(table)).getTunnelInfos()) {
            if (info.getTunnelName().equals(name)) {
                return info.getTunnelId();
            }
        }
        return client.createTunnel(new CreateTunnelRequest(table, name, TunnelType.BaseAndStream)).getTunnelId();
    }

    public static void main(String[] args) throws Exception {
        ClientConfiguration conf = new ClientConfiguration();
        conf.setEnableResponseValidation("true".equals(System.getenv("RESPONSE_VALIDATION")));
        TunnelClient client = new TunnelClient(env("OTS_ENDPOINT"), env("OTS_ACCESS_KEY_ID"),
                env("OTS_ACCESS_KEY_SECRET"), env("OTS_INSTANCE"), conf);
        String table = env("OTS_TABLE");
        String tunnelName = env("OTS_TUNNEL_NAME");
        String tunnelId = tunnelId(client, table, tunnelName);
        FileOutputStream out = new FileOutputStream(env("RECORDS_FILE"), true);
        TunnelWorkerConfig config = new TunnelWorkerConfig(new RecordsFile(out));
        // The SDK checks the timeout against the interval already set: the interval first.
        config.setHeartbeatIntervalInSec(envLong("HEARTBEAT_INTERVAL_SEC", 5));
        config.setHeartbeatTimeoutInSec(envLong("HEARTBEAT_TIMEOUT_SEC", 15));
        config.setCheckpointIntervalInMillis(envLong("CHECKPOINT_INTERVAL_MS", 200));
        TunnelWorker worker = new TunnelWorker(tunnelId, client, config);
        worker.connectAndWorking();
        System.out.println("working " + tunnelId);
        System.out.flush();

        BufferedReader stdin = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        Gson gson = new GsonBuilder().serializeNulls().create();
        SyncClient tables = new SyncClient(env("OTS_ENDPOINT"), env("OTS_ACCESS_KEY_ID"),
                env("OTS_ACCESS_KEY_SECRET"), env("OTS_INSTANCE"));
        while ((line = stdin.readLine()) != null && !line.trim().equals("stop")) {
            String[] words = line.trim().split(" ");
            if (words[0].equals("describe")) {
                System.out.println(gson.toJson(describe(client.describeTunnel(
                        new DescribeTunnelRequest(table, tunnelName)))));
            } else if (words[0].equals("delete-version")) {
                RowUpdateChange change = new RowUpdateChange(table, PrimaryKeyBuilder.createPrimaryKeyBuilder()
                        .addPrimaryKeyColumn("id", PrimaryKeyValue.fromLong(Long.parseLong(words[1]))).build());
                change.deleteColumn(words[2], Long.parseLong(words[3]));
                tables.updateRow(new UpdateRowRequest(change));
                System.out.println("ok");
            }
            System.out.flush();
        }
        tables.shutdown();
        worker.shutdown();
        config.shutdown();
        client.shutdown();
        synchronized (out) {
            out.close();
        }
        System.out.println("stopped");
        System.out.flush();
        // The SDK's executors may keep non-daemon threads; everything is shut down and flushed by now.
        System.exit(0);
    }
}
