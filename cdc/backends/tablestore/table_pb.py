"""Protobuf messages of Tablestore's table API (``table_store.proto``, ``table_store_filter.proto``), built at
import time by :func:`.proto.build`: the subset the backend's client (DescribeTable, GetRange,
ComputeSplitPointsBySize) and the local server (table creation, row writes and reads, filters) use, with the
field numbers of the service's public protocol, so the official SDKs read what is written here and the
reverse (the tests run the Python, Node.js and Java SDKs against the local server).

Message classes and enum values are module attributes, as in the SDK's generated module::

    from cdc.backends.tablestore import table_pb as pb

    req = pb.GetRangeRequest(table_name="orders", direction=pb.FORWARD, max_versions=1, ...)

``SplitLocation`` is nested in ``ComputeSplitPointsBySizeResponse`` in the public file; a name is not part of
the wire format, so it is a top-level message here.
"""

from __future__ import annotations

from typing import Any

from cdc.backends.tablestore.proto import Field, build

PACKAGE = "com.aliyun.tablestore.protocol"

_ENUMS: dict[str, list[tuple[str, int]]] = {
    'PrimaryKeyType': [('INTEGER', 1), ('STRING', 2), ('BINARY', 3), ('PK_BOOLEAN', 5)],
    'PrimaryKeyOption': [('AUTO_INCREMENT', 1)],
    'DefinedColumnType': [('DCT_INTEGER', 1), ('DCT_DOUBLE', 2), ('DCT_BOOLEAN', 3), ('DCT_STRING', 4), ('DCT_BLOB', 7)],
    'SSEKeyType': [('SSE_KMS_SERVICE', 1), ('SSE_BYOK', 2)],
    'IndexUpdateMode': [('IUM_ASYNC_INDEX', 0), ('IUM_SYNC_INDEX', 1)],
    'IndexType': [('IT_GLOBAL_INDEX', 0), ('IT_LOCAL_INDEX', 1)],
    'RowExistenceExpectation': [('IGNORE', 0), ('EXPECT_EXIST', 1), ('EXPECT_NOT_EXIST', 2)],
    'ReturnType': [('RT_NONE', 0), ('RT_PK', 1), ('RT_AFTER_MODIFY', 2)],
    'OperationType': [('PUT', 1), ('UPDATE', 2), ('DELETE', 3)],
    'Direction': [('FORWARD', 0), ('BACKWARD', 1)],
    'FilterType': [('FT_SINGLE_COLUMN_VALUE', 1), ('FT_COMPOSITE_COLUMN_VALUE', 2), ('FT_COLUMN_PAGINATION', 3)],
    'ComparatorType': [('CT_EQUAL', 1), ('CT_NOT_EQUAL', 2), ('CT_GREATER_THAN', 3), ('CT_GREATER_EQUAL', 4), ('CT_LESS_THAN', 5), ('CT_LESS_EQUAL', 6), ('CT_EXIST', 7), ('CT_NOT_EXIST', 8)],
    'VariantType': [('VT_INTEGER', 0), ('VT_DOUBLE', 1), ('VT_STRING', 3), ('VT_NULL', 6), ('VT_BLOB', 7)],
    'LogicalOperator': [('LO_NOT', 1), ('LO_AND', 2), ('LO_OR', 3)],
    'StreamStatus': [('STREAM_ENABLING', 1), ('STREAM_ACTIVE', 2)],
    'ActionType': [('PUT_ROW', 1), ('UPDATE_ROW', 2), ('DELETE_ROW', 3)],
    'SQLPayloadVersion': [('SQL_PLAIN_BUFFER', 1), ('SQL_FLAT_BUFFERS', 2)],
    'SQLStatementType': [('SQL_SELECT', 1), ('SQL_CREATE_TABLE', 2), ('SQL_SHOW_TABLE', 3), ('SQL_DESCRIBE_TABLE', 4), ('SQL_DROP_TABLE', 5), ('SQL_ALTER_TABLE', 6)],
}
_MESSAGES: dict[str, list[Field]] = {
    'Error': [
        ('code', 1, 'req', 'string'),
        ('message', 2, 'opt', 'string'),
    ],
    'CreateTableRequest': [
        ('table_meta', 1, 'req', 'TableMeta'),
        ('reserved_throughput', 2, 'req', 'ReservedThroughput'),
        ('table_options', 3, 'opt', 'TableOptions'),
        ('partitions', 4, 'rep', 'PartitionRange'),
        ('stream_spec', 5, 'opt', 'StreamSpecification'),
        ('sse_spec', 6, 'opt', 'SSESpecification'),
        ('index_metas', 7, 'rep', 'IndexMeta'),
    ],
    'TableMeta': [
        ('table_name', 1, 'req', 'string'),
        ('primary_key', 2, 'rep', 'PrimaryKeySchema'),
        ('defined_column', 3, 'rep', 'DefinedColumnSchema'),
    ],
    'PrimaryKeySchema': [
        ('name', 1, 'req', 'string'),
        ('type', 2, 'req', 'PrimaryKeyType'),
        ('option', 3, 'opt', 'PrimaryKeyOption'),
    ],
    'DefinedColumnSchema': [
        ('name', 1, 'req', 'string'),
        ('type', 2, 'req', 'DefinedColumnType'),
    ],
    'ReservedThroughput': [
        ('capacity_unit', 1, 'req', 'CapacityUnit'),
    ],
    'CapacityUnit': [
        ('read', 1, 'opt', 'int32'),
        ('write', 2, 'opt', 'int32'),
    ],
    'TableOptions': [
        ('time_to_live', 1, 'opt', 'int32'),
        ('max_versions', 2, 'opt', 'int32'),
        ('deviation_cell_version_in_sec', 5, 'opt', 'int64'),
        ('allow_update', 6, 'opt', 'bool'),
    ],
    'PartitionRange': [
        ('begin', 1, 'req', 'bytes'),
        ('end', 2, 'req', 'bytes'),
    ],
    'StreamSpecification': [
        ('enable_stream', 1, 'req', 'bool'),
        ('expiration_time', 2, 'opt', 'int32'),
    ],
    'SSESpecification': [
        ('enable', 1, 'req', 'bool'),
        ('key_type', 2, 'opt', 'SSEKeyType'),
        ('key_id', 3, 'opt', 'bytes'),
        ('role_arn', 4, 'opt', 'bytes'),
    ],
    'IndexMeta': [
        ('name', 1, 'req', 'string'),
        ('primary_key', 2, 'rep', 'string'),
        ('defined_column', 3, 'rep', 'string'),
        ('index_update_mode', 4, 'req', 'IndexUpdateMode'),
        ('index_type', 5, 'req', 'IndexType'),
    ],
    'CreateTableResponse': [],
    'DescribeTableRequest': [
        ('table_name', 1, 'req', 'string'),
    ],
    'DescribeTableResponse': [
        ('table_meta', 1, 'req', 'TableMeta'),
        ('reserved_throughput_details', 2, 'req', 'ReservedThroughputDetails'),
        ('table_options', 3, 'req', 'TableOptions'),
        ('stream_details', 5, 'opt', 'StreamDetails'),
        ('shard_splits', 6, 'rep', 'bytes'),
        ('sse_details', 7, 'opt', 'SSEDetails'),
        ('index_metas', 8, 'rep', 'IndexMeta'),
    ],
    'ReservedThroughputDetails': [
        ('capacity_unit', 1, 'req', 'CapacityUnit'),
        ('last_increase_time', 2, 'req', 'int64'),
        ('last_decrease_time', 3, 'opt', 'int64'),
    ],
    'StreamDetails': [
        ('enable_stream', 1, 'req', 'bool'),
        ('stream_id', 2, 'opt', 'string'),
        ('expiration_time', 3, 'opt', 'int32'),
        ('last_enable_time', 4, 'opt', 'int64'),
    ],
    'SSEDetails': [
        ('enable', 1, 'req', 'bool'),
        ('key_type', 2, 'opt', 'SSEKeyType'),
        ('key_id', 3, 'opt', 'bytes'),
        ('role_arn', 4, 'opt', 'bytes'),
    ],
    'ListTableRequest': [],
    'ListTableResponse': [
        ('table_names', 1, 'rep', 'string'),
    ],
    'DeleteTableRequest': [
        ('table_name', 1, 'req', 'string'),
    ],
    'DeleteTableResponse': [],
    'GetRowRequest': [
        ('table_name', 1, 'req', 'string'),
        ('primary_key', 2, 'req', 'bytes'),
        ('columns_to_get', 3, 'rep', 'string'),
        ('time_range', 4, 'opt', 'TimeRange'),
        ('max_versions', 5, 'opt', 'int32'),
        ('filter', 7, 'opt', 'bytes'),
        ('start_column', 8, 'opt', 'string'),
        ('end_column', 9, 'opt', 'string'),
        ('token', 10, 'opt', 'bytes'),
        ('transaction_id', 11, 'opt', 'string'),
    ],
    'TimeRange': [
        ('start_time', 1, 'opt', 'int64'),
        ('end_time', 2, 'opt', 'int64'),
        ('specific_time', 3, 'opt', 'int64'),
    ],
    'GetRowResponse': [
        ('consumed', 1, 'req', 'ConsumedCapacity'),
        ('row', 2, 'req', 'bytes'),
        ('next_token', 3, 'opt', 'bytes'),
    ],
    'ConsumedCapacity': [
        ('capacity_unit', 1, 'req', 'CapacityUnit'),
    ],
    'PutRowRequest': [
        ('table_name', 1, 'req', 'string'),
        ('row', 2, 'req', 'bytes'),
        ('condition', 3, 'req', 'Condition'),
        ('return_content', 4, 'opt', 'ReturnContent'),
        ('transaction_id', 5, 'opt', 'string'),
    ],
    'Condition': [
        ('row_existence', 1, 'req', 'RowExistenceExpectation'),
        ('column_condition', 2, 'opt', 'bytes'),
    ],
    'ReturnContent': [
        ('return_type', 1, 'opt', 'ReturnType'),
        ('return_column_names', 2, 'rep', 'string'),
    ],
    'PutRowResponse': [
        ('consumed', 1, 'req', 'ConsumedCapacity'),
        ('row', 2, 'opt', 'bytes'),
    ],
    'UpdateRowRequest': [
        ('table_name', 1, 'req', 'string'),
        ('row_change', 2, 'req', 'bytes'),
        ('condition', 3, 'req', 'Condition'),
        ('return_content', 4, 'opt', 'ReturnContent'),
        ('transaction_id', 5, 'opt', 'string'),
    ],
    'UpdateRowResponse': [
        ('consumed', 1, 'req', 'ConsumedCapacity'),
        ('row', 2, 'opt', 'bytes'),
    ],
    'DeleteRowRequest': [
        ('table_name', 1, 'req', 'string'),
        ('primary_key', 2, 'req', 'bytes'),
        ('condition', 3, 'req', 'Condition'),
        ('return_content', 4, 'opt', 'ReturnContent'),
        ('transaction_id', 5, 'opt', 'string'),
    ],
    'DeleteRowResponse': [
        ('consumed', 1, 'req', 'ConsumedCapacity'),
        ('row', 2, 'opt', 'bytes'),
    ],
    'BatchWriteRowRequest': [
        ('tables', 1, 'rep', 'TableInBatchWriteRowRequest'),
        ('transaction_id', 2, 'opt', 'string'),
    ],
    'TableInBatchWriteRowRequest': [
        ('table_name', 1, 'req', 'string'),
        ('rows', 2, 'rep', 'RowInBatchWriteRowRequest'),
    ],
    'RowInBatchWriteRowRequest': [
        ('type', 1, 'req', 'OperationType'),
        ('row_change', 2, 'req', 'bytes'),
        ('condition', 3, 'req', 'Condition'),
        ('return_content', 4, 'opt', 'ReturnContent'),
    ],
    'BatchWriteRowResponse': [
        ('tables', 1, 'rep', 'TableInBatchWriteRowResponse'),
    ],
    'TableInBatchWriteRowResponse': [
        ('table_name', 1, 'req', 'string'),
        ('rows', 2, 'rep', 'RowInBatchWriteRowResponse'),
    ],
    'RowInBatchWriteRowResponse': [
        ('is_ok', 1, 'req', 'bool'),
        ('error', 2, 'opt', 'Error'),
        ('consumed', 3, 'opt', 'ConsumedCapacity'),
        ('row', 4, 'opt', 'bytes'),
    ],
    'GetRangeRequest': [
        ('table_name', 1, 'req', 'string'),
        ('direction', 2, 'req', 'Direction'),
        ('columns_to_get', 3, 'rep', 'string'),
        ('time_range', 4, 'opt', 'TimeRange'),
        ('max_versions', 5, 'opt', 'int32'),
        ('limit', 6, 'opt', 'int32'),
        ('inclusive_start_primary_key', 7, 'req', 'bytes'),
        ('exclusive_end_primary_key', 8, 'req', 'bytes'),
        ('filter', 10, 'opt', 'bytes'),
        ('start_column', 11, 'opt', 'string'),
        ('end_column', 12, 'opt', 'string'),
        ('token', 13, 'opt', 'bytes'),
        ('transaction_id', 14, 'opt', 'string'),
    ],
    'GetRangeResponse': [
        ('consumed', 1, 'req', 'ConsumedCapacity'),
        ('rows', 2, 'req', 'bytes'),
        ('next_start_primary_key', 3, 'opt', 'bytes'),
        ('next_token', 4, 'opt', 'bytes'),
    ],
    'ComputeSplitPointsBySizeRequest': [
        ('table_name', 1, 'req', 'string'),
        ('split_size', 2, 'req', 'int64'),
        ('split_size_unit_in_byte', 3, 'opt', 'int64'),
    ],
    'ComputeSplitPointsBySizeResponse': [
        ('consumed', 1, 'req', 'ConsumedCapacity'),
        ('schema', 2, 'rep', 'PrimaryKeySchema'),
        ('split_points', 3, 'rep', 'bytes'),
        ('locations', 4, 'rep', 'SplitLocation'),
    ],
    'SplitLocation': [
        ('location', 1, 'req', 'string'),
        ('repeat', 2, 'req', 'sint64'),
    ],
    'Filter': [
        ('type', 1, 'req', 'FilterType'),
        ('filter', 2, 'req', 'bytes'),
    ],
    'SingleColumnValueFilter': [
        ('comparator', 1, 'req', 'ComparatorType'),
        ('column_name', 2, 'req', 'string'),
        ('column_value', 3, 'req', 'bytes'),
        ('filter_if_missing', 4, 'req', 'bool'),
        ('latest_version_only', 5, 'req', 'bool'),
        ('value_trans_rule', 6, 'opt', 'ValueTransferRule'),
    ],
    'ValueTransferRule': [
        ('regex', 1, 'req', 'string'),
        ('cast_type', 2, 'opt', 'VariantType'),
    ],
    'CompositeColumnValueFilter': [
        ('combinator', 1, 'req', 'LogicalOperator'),
        ('sub_filters', 2, 'rep', 'Filter'),
    ],
    'ColumnPaginationFilter': [
        ('offset', 1, 'req', 'int32'),
        ('limit', 2, 'req', 'int32'),
    ],
}

_classes: dict[str, Any] = build("cdc_table_store.proto", PACKAGE, _ENUMS, _MESSAGES)
globals().update(_classes)
for _values in _ENUMS.values():
    globals().update(dict(_values))

MESSAGE_NAMES: tuple[str, ...] = tuple(_MESSAGES)
ENUM_VALUES: dict[str, list[tuple[str, int]]] = _ENUMS
"""Enum name -> its (value name, number) pairs."""


def __getattr__(name: str) -> Any:  # for type checkers: the names above are set through globals()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
